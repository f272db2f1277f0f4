"""Values as data between the grader and a jailed submission (``worker.py``): JSON, never pickle.

The grader sends the checker's inputs and the submission sends back what its functions returned.
What comes back is untrusted: decoding builds only plain values (numbers, strings, lists, tuples,
dicts, sets), tensors and numpy arrays and scalars from their bytes and a dtype of a fixed list,
named tuples, and the states of ``random.Random`` and ``torch.Generator``; it never imports a
module or calls a class the message names. Anything else a student's function returns arrives as
its ``repr`` (a :class:`Opaque`), which no check accepts.

Standard library and torch only: this module is also imported inside the jail.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import random

MAX_MESSAGE = 64 << 20  # bytes of one message; a longer one is refused, not parsed
_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
           "uint8", "bool", "complex64", "complex128")


class WireError(ValueError):
    """A message that is not what the protocol allows (from a broken or hostile submission)."""


class Opaque:
    """A returned object that is not plain data: only its type's name and ``repr`` come back."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text


def encode(value, _depth: int = 0):
    """A JSON-ready form of ``value``."""
    import torch

    if _depth > 64:
        raise WireError("a value nested more than 64 levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2 ** 53 else {"int": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype == "bfloat16":
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes() if t.numel() else b""
        return {"tensor": base64.b64encode(raw).decode(), "dtype": dtype,
                "shape": list(t.shape), "grad": bool(value.requires_grad)}
    if type(value).__module__ == "numpy":  # numpy arrays and scalars keep their type
        import numpy as np

        if isinstance(value, np.ndarray) and value.dtype.name in _DTYPES:
            raw = np.ascontiguousarray(value).tobytes()
            return {"ndarray": base64.b64encode(raw).decode(), "dtype": value.dtype.name,
                    "shape": list(value.shape)}
        if isinstance(value, np.generic) and value.dtype.name in _DTYPES:
            return {"npscalar": value.dtype.name, "value": encode(value.item(), _depth + 1)}
    if isinstance(value, torch.Generator):
        return {"generator": encode(value.get_state())}
    if isinstance(value, random.Random):
        version, internal, gauss = value.getstate()
        return {"random": [version, list(internal), gauss]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {"namedtuple": type(value).__name__, "fields": list(value._fields),
                "values": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, (list, tuple, set, frozenset)):
        kind = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
        name = next(k for t, k in kind.items() if isinstance(value, t))
        items = sorted(value, key=repr) if name in ("set", "frozenset") else value
        return {name: [encode(v, _depth + 1) for v in items]}
    if isinstance(value, dict):
        return {"dict": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in value.items()]}
    return {"opaque": type(value).__name__, "repr": repr(value)[:500]}


def decode(obj, requires_grad: bool = True, _depth: int = 0):
    """The value of an :func:`encode` form; ``requires_grad`` False drops the tensors' flag."""
    import torch

    if _depth > 64:
        raise WireError("a value nested more than 64 levels deep")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):  # only inside the forms below
        raise WireError("a bare list where a tagged value was expected")
    if not isinstance(obj, dict) or len(obj) == 0:
        raise WireError(f"not a value: {str(obj)[:80]}")
    down = _depth + 1
    try:
        if "tensor" in obj:
            dtype = obj["dtype"]
            if dtype not in _DTYPES:
                raise WireError(f"a tensor of unknown dtype {dtype!r}")
            shape = [int(n) for n in obj["shape"]]
            raw = base64.b64decode(obj["tensor"])
            if dtype == "bfloat16":
                flat = torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16)
            elif raw:
                flat = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype))
            else:
                flat = torch.empty(0, dtype=getattr(torch, dtype))
            t = flat.reshape(shape).clone()
            if requires_grad and obj.get("grad") and t.is_floating_point():
                t.requires_grad_()
            return t
        if "ndarray" in obj or "npscalar" in obj:
            import numpy as np

            dtype = obj.get("dtype", obj.get("npscalar"))
            if dtype not in _DTYPES or dtype == "bfloat16":
                raise WireError(f"a numpy value of unknown dtype {dtype!r}")
            if "npscalar" in obj:
                return np.dtype(dtype).type(decode(obj["value"], False, down))
            raw = base64.b64decode(obj["ndarray"])
            return np.frombuffer(raw, dtype=dtype).reshape([int(n) for n in obj["shape"]]).copy()
        if "int" in obj:
            return int(obj["int"])
        if "float" in obj:
            return float(obj["float"])
        if "generator" in obj:
            gen = torch.Generator()
            gen.set_state(decode(obj["generator"], False, down))
            return gen
        if "random" in obj:
            version, internal, gauss = obj["random"]
            rng = random.Random()
            rng.setstate((int(version), tuple(int(x) for x in internal), gauss))
            return rng
        if "namedtuple" in obj:
            make = collections.namedtuple(str(obj["namedtuple"]), [str(f) for f in obj["fields"]])
            return make(*[decode(v, requires_grad, down) for v in obj["values"]])
        for name, kind in (("list", list), ("tuple", tuple), ("set", set),
                           ("frozenset", frozenset)):
            if name in obj:
                return kind(decode(v, requires_grad, down) for v in obj[name])
        if "dict" in obj:
            return {decode(k, False, down): decode(v, requires_grad, down) for k, v in obj["dict"]}
        if "opaque" in obj:
            return Opaque(str(obj["opaque"]), str(obj["repr"]))
    except WireError:
        raise
    except (TypeError, ValueError, KeyError, RuntimeError, OverflowError) as err:
        raise WireError(f"a malformed value ({type(err).__name__}: {err})") from None
    raise WireError(f"not a value: {str(obj)[:80]}")


def dumps(message: dict) -> bytes:
    return json.dumps(message, allow_nan=False).encode() + b"\n"


def loads(line: bytes) -> dict:
    if len(line) > MAX_MESSAGE:
        raise WireError(f"a message of {len(line)} bytes (at most {MAX_MESSAGE})")
    try:
        message = json.loads(line)
    except ValueError as err:
        raise WireError(f"not a JSON message ({err})") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message
