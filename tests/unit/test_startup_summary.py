"""The start-up banner of `--role=all` says where each listener is really bound (issue 11: it used
to print 127.0.0.1 for sockets open on every interface)."""

from __future__ import annotations

from dataclasses import dataclass

from tfusion.embedded.summary import startup_summary
from tfusion.settings import Settings


@dataclass
class Runtime:
    """What the controller role hands the banner: the addresses its sockets are bound to."""

    address: tuple[str, int]
    probe_address: tuple[str, int]


def banner(settings: Settings, controller: tuple[str, int], probes: tuple[str, int], hypervisor_port: int) -> str:
    return startup_summary(settings, {"controller": Runtime(controller, probes), "hypervisor": hypervisor_port},
                           None, None)


def line(text: str, label: str) -> str:
    return next(row for row in text.splitlines() if row.strip().startswith(label))


def test_loopback_listeners_say_so() -> None:
    text = banner(Settings.load({}, env={}, roles=("all",)), ("127.0.0.1", 8080), ("127.0.0.1", 8081), 8001)
    assert "http://127.0.0.1:8080" in line(text, "controller") and "bound to 127.0.0.1:8080, loopback only" in text
    assert "bound to 127.0.0.1:8081, loopback only" in line(text, "probes")
    assert "bound to 127.0.0.1:8001, loopback only" in line(text, "hypervisor")


def test_listeners_on_every_interface_say_so() -> None:
    settings = Settings.load({"hypervisor_host": "0.0.0.0"}, env={}, roles=("all",))
    text = banner(settings, ("0.0.0.0", 8080), ("::", 8081), 8001)
    assert "http://127.0.0.1:8080" in line(text, "controller")  # where to point curl
    assert "bound to 0.0.0.0:8080, all interfaces" in line(text, "controller")
    assert "bound to [::]:8081, all interfaces" in line(text, "probes")
    assert "bound to 0.0.0.0:8001, all interfaces" in line(text, "hypervisor")


def test_a_specific_address_is_printed_as_bound() -> None:
    settings = Settings.load({"hypervisor_host": "10.1.2.3"}, env={}, roles=("all",))
    text = banner(settings, ("10.1.2.3", 8080), ("127.0.0.1", 8081), 9001)
    assert "http://10.1.2.3:8080" in text and "bound to 10.1.2.3:8080)" in text
    assert "http://10.1.2.3:9001" in line(text, "hypervisor") and "curl http://10.1.2.3:9001/api/v1/devices" in text
