"""The file a kernel's trace build writes (src/common/timeline.cuh, Clocks): uint32 SM clocks
[ctas][roles][steps][events], then per traced CTA clock64 and globaltimer (ns) at its start and end.
Read by the kernels' summary scripts (trace_summary.py, prefill_trace_summary.py,
sparse_trace_summary.py), each with its own shape and event names."""
import struct


def load_clocks(path, ctas, roles, steps, events):
    """(at, spans): at(cta, role, step, event) is the clock recorded there (0: not recorded); spans is
    the flat list of the CTAs' (clock64 start, ns start, clock64 end, ns end)."""
    raw = open(path, "rb").read()
    n = ctas * roles * steps * events
    clocks = struct.unpack_from(f"<{n}I", raw, 0)
    spans = struct.unpack_from(f"<{ctas * 4}Q", raw, 4 * n)

    def at(c, r, s, e):
        return clocks[((c * roles + r) * steps + s) * events + e]

    return at, spans


def signed_delta(a, b):
    """b - a on the wrapping 32-bit SM clock, as a signed difference."""
    d = (b - a) & 0xFFFFFFFF
    return d - (1 << 32) if d >= 1 << 31 else d
