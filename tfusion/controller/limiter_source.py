"""Where a soft-isolated pod's limiter library comes from, for both places that copy it in.

tfusion ships its own open limiter (native/limiter, `libcuda_limiter.so`), built into the tfusion
image at `IMAGE_LIMITER_DIR`; it is the default for NVIDIA (and pods that name no vendor). A
ProviderConfig that names `spec.images.middleware` still wins: that image is the original's vendor
layout, its files under /build (the limiter and a wrapped `nvidia-smi`), copied tolerantly as the
original does. Other vendors have no limiter of ours, so they need the ProviderConfig's image.

Why a module: the webhook (local soft pods, render.py) and the workers reconciler (worker pods,
worker_shape.py) both copy the library in with an init container and must agree on the image, the
copy command and which files the shared volume then holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfusion import __version__
from tfusion.api.accessors import text
from tfusion.api.jsontypes import JsonMapping, JsonValue

#: the tfusion image as deploy/base names it (kustomize `images: tfusion`, tag = the package version);
#: a renamed image is given with --limiter-image / TF_LIMITER_IMAGE
TFUSION_IMAGE = f"tfusion:{__version__}"
#: where the Containerfile puts `make -C native/limiter`'s output in the tfusion image
IMAGE_LIMITER_DIR = "/opt/tfusion/lib"
OWN_LIMITER_LIBRARY = "libcuda_limiter.so"
#: what a ProviderConfig's `spec.images.middleware` (a required field) says to mean "tfusion's own
#: limiter, from the image the controller names" (deploy/overlays/defaults does)
OWN_MIDDLEWARE_NAME = "tfusion"
#: vendors our limiter serves (CUDA); "" is a pod that names none (NVIDIA by default)
OWN_LIMITER_VENDORS = frozenset({"", "nvidia"})


@dataclass(frozen=True)
class LimiterSource:
    """The image an init container copies the limiter from, and whether it is tfusion's own."""

    image: str
    own: bool

    def copy_command(self, into: str) -> list[JsonValue]:
        """The init container's command: copy the library into the shared volume at `into`."""
        if self.own:  # our image always has it: a missing file is an error the pod shows
            return ["cp", f"{IMAGE_LIMITER_DIR}/{OWN_LIMITER_LIBRARY}", f"{into}/"]
        # the vendor image's layout; tolerant as the original's (an image without the files still starts)
        return ["sh", "-c", f"cp /build/* {into}/ 2>/dev/null; true"]

    @property
    def ships_nvidia_smi(self) -> bool:
        """Whether the copied files include a wrapped `nvidia-smi` to mount over the real one (ours
        does not need one: the preloaded library answers NVML's memory query with the share)."""
        return not self.own


def limiter_source(provider: JsonMapping | None, vendor: str, own_image: str = TFUSION_IMAGE) -> LimiterSource | None:
    """The ProviderConfig's middleware image, else tfusion's own for the vendors it serves, else None.
    A middleware of `tfusion` (or `own_image` itself) names tfusion's own limiter, which serves CUDA only."""
    named = text(provider, "spec", "images", "middleware")
    if named and named not in (OWN_MIDDLEWARE_NAME, own_image):
        return LimiterSource(image=named, own=False)
    if vendor.lower() in OWN_LIMITER_VENDORS and own_image:
        return LimiterSource(image=own_image, own=True)
    return None
