"""`json_depth_problem`: every JSON body is refused with 400 when it nests deeper than
`MAX_JSON_DEPTH`, by a scan without recursion, before any decoder sees it (msgspec has no depth
limit of its own: a deep body would be a RecursionError, a 500).
"""

from __future__ import annotations

import itertools
import mmap
import operator
import re
import time

from tfusion.api.documents import MAX_DEPTH

#: objects and arrays in a JSON body may nest this deep (the bound of every document tfusion reads)
MAX_JSON_DEPTH = MAX_DEPTH


#: bytes scanned per step: a step holds the GIL for about a millisecond at worst (a body of brackets)
_DEPTH_STEP = 64 * 1024
#: brackets to depth steps: an opening one counts 2, a closing one 0 (the running sum minus the
#: count of brackets is the depth)
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
#: every byte but quotes and brackets, dropped first: what is left of a step is a few KiB at most
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_JSON_SPACE = re.compile(rb"[ \t\r\n]*")
_ESCAPE = re.compile(rb"\\.", re.DOTALL)


def json_depth_problem(body: bytes | bytearray | mmap.mmap, max_depth: int = MAX_JSON_DEPTH, *,
                       yield_gil: bool = False) -> str | None:
    """What is wrong when a JSON text nests objects and arrays deeper than `max_depth`, else None.

    Without recursion and without decoding: the text is scanned in steps of `_DEPTH_STEP` bytes,
    each step with bytes operations (escapes dropped, strings cut out at the quotes, the brackets
    left turned into a running depth by `itertools.accumulate`); `yield_gil` (in a worker thread)
    lets the event loop run between steps. A text that does not start as a JSON object or array is not
    JSON for this purpose (YAML has its own reader with its own bounds); a malformed one may be
    misjudged here, and its decoder refuses it anyway."""
    first = _JSON_SPACE.match(body)
    offset = first.end() if first else 0
    if offset >= len(body) or body[offset] not in b"[{":
        return None
    if isinstance(body, bytes | bytearray) and len(body) <= _DEPTH_STEP and \
            body.count(b"[") + body.count(b"{") <= max_depth:
        return None
    view = memoryview(body)
    depth, in_string, escaped = 0, False, False
    for start in range(offset, len(body), _DEPTH_STEP):
        step = bytes(view[start:start + _DEPTH_STEP])
        if escaped:  # the previous step ended with a backslash: it escapes this step's first byte
            step = step[1:]
        trailing = len(step) - len(step.rstrip(b"\\"))
        escaped = trailing % 2 == 1
        if escaped:
            step = step[:-1]
        if b"\\" in step:  # an escape and what it escapes (an escaped quote ends no string)
            step = _ESCAPE.sub(b"", step)
        kept = step.translate(None, _NOT_STRUCTURE)
        if in_string:  # the step starts inside a string: up to its closing quote is not structure
            close = kept.find(b'"')
            in_string = close < 0
            kept = b"" if in_string else kept[close + 1:]
        # two quotes with no bracket between them open and close a string, or close one and open
        # the next: dropping them leaves what is inside strings the same (and most strings go)
        pieces = kept.replace(b'""', b"").split(b'"')
        outside = b"".join(pieces[0::2])
        in_string = in_string or len(pieces) % 2 == 0
        brackets = outside.translate(_BRACKET_STEPS)
        opens = brackets.count(2)
        if depth + opens > max_depth:
            deepest = max(map(operator.sub, itertools.accumulate(brackets), itertools.count(1 - depth)))
            if deepest > max_depth:
                return f"nested more than {max_depth} levels deep"
        depth += 2 * opens - len(brackets)
        if yield_gil:
            # hand the GIL over between steps: a thread that keeps it until the interpreter asks
            # (every 5 ms) makes the event loop wait that long after each of its system calls
            time.sleep(0)
    return None
