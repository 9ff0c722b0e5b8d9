"""Messages between the grader and a worker: JSON plus raw tensor bytes, never pickle.

The grader reads what an untrusted worker sends, so decoding must not run code: values
are None, bool, int, float, str, list, tuple, dict with str keys, torch dtypes, and
tensors (dtype, shape, strides and offset over a storage sent as bytes; views that share
a storage arrive sharing it, as a guarded tensor shares its buffer with its margins).
A frame is: 8-byte length of the JSON header, the header, then each blob as 8-byte
length + bytes. Sizes are capped so that a worker cannot make the grader run out of memory.
"""
import json
import math
import struct

import torch

MAX_FRAME = 1 << 30  # bytes a worker may send in one message

_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}
_LEN = struct.Struct("<Q")


class WireError(Exception):
    """The other side sent something that is not a valid message."""


def _storage_bytes(t):
    storage = t.untyped_storage()
    storage = storage.cpu() if storage.device.type != "cpu" else storage
    # Through numpy: bytes(storage) walks it element by element (seconds per million floats).
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy().tobytes()


def encode(value):
    """(header, blobs) for a value; tensors that share a storage share one blob. An object
    with a `remote_name` (a proxy of a notebook object) is sent as {"ref": name}."""
    blobs, seen = [], {}

    def enc(v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"float": repr(v)}
        if isinstance(v, (list, tuple)):
            items = [enc(x) for x in v]
            return items if isinstance(v, list) else {"tuple": items}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise WireError("only dicts with str keys can be sent")
            return {"dict": {k: enc(x) for k, x in v.items()}}
        if isinstance(getattr(v, "remote_name", None), str):
            return {"ref": v.remote_name}
        if isinstance(v, torch.dtype):
            return {"dtype": str(v).replace("torch.", "")}
        if isinstance(v, torch.Tensor):
            t = v.detach()
            key = (t.device.type, t.untyped_storage().data_ptr())
            if key not in seen:
                seen[key] = len(blobs)
                blobs.append(_storage_bytes(t))
            return {"tensor": {"blob": seen[key], "dtype": str(t.dtype).replace("torch.", ""),
                               "shape": list(t.shape), "stride": list(t.stride()),
                               "offset": t.storage_offset(), "device": t.device.type}}
        raise WireError(f"a {type(v).__name__} cannot be sent between the grader and the notebook")
    return enc(value), blobs


def decode(header, blobs, resolve=None):
    """The value encoded in header/blobs; a tensor goes to the device type it was sent from
    (the CPU where no GPU is).
    {"ref": name} values (see encode's `ref`) are given to `resolve`; without it they
    are refused."""
    storages = {}

    def storage(index, dtype, where):
        if not isinstance(index, int) or not 0 <= index < len(blobs):
            raise WireError("a tensor names a blob that was not sent")
        key = (index, dtype, where)
        if key not in storages:
            raw = blobs[index]
            if len(raw) % _DTYPES[dtype].itemsize:
                raise WireError("a blob is not a whole number of elements")
            flat = (torch.frombuffer(bytearray(raw), dtype=_DTYPES[dtype]) if raw
                    else torch.empty(0, dtype=_DTYPES[dtype]))
            storages[key] = flat.to(where)
        return storages[key]

    def dec(v):
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict) or len(v) != 1:
            raise WireError("malformed value")
        (kind, body), = v.items()
        if kind == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if kind == "tuple" and isinstance(body, list):
            return tuple(dec(x) for x in body)
        if kind == "dict" and isinstance(body, dict):
            return {str(k): dec(x) for k, x in body.items()}
        if kind == "ref" and resolve is not None and isinstance(body, str):
            return resolve(body)
        if kind == "dtype" and body in _DTYPES:
            return _DTYPES[body]
        if kind == "tensor" and isinstance(body, dict) and body.get("dtype") in _DTYPES:
            where = "cuda" if body.get("device") == "cuda" and torch.cuda.is_available() else "cpu"
            flat = storage(body.get("blob"), body["dtype"], where)
            shape, stride, offset = body.get("shape"), body.get("stride"), body.get("offset")
            if not (isinstance(shape, list) and isinstance(stride, list) and isinstance(offset, int)
                    and len(shape) == len(stride)
                    and all(isinstance(x, int) and x >= 0 for x in shape + stride + [offset])):
                raise WireError("malformed tensor")
            try:  # as_strided checks that the view stays inside its storage
                return flat.as_strided(shape, stride, offset)
            except RuntimeError as error:
                raise WireError(f"malformed tensor: {error}") from None
        raise WireError(f"malformed value of kind {kind!r}")
    return dec(header)


def write(stream, message: dict):
    """Send a dict whose values may hold tensors."""
    header, blobs = encode(message)
    data = json.dumps(header).encode()
    parts = [_LEN.pack(len(data)), data, _LEN.pack(len(blobs))]
    for blob in blobs:
        parts += [_LEN.pack(len(blob)), blob]
    stream.write(b"".join(parts))
    stream.flush()


def _read_exact(stream, n, budget):
    if n > budget[0]:
        raise WireError(f"message larger than {MAX_FRAME} bytes")
    budget[0] -= n
    data = bytearray()
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("the other side closed the connection")
        data += chunk
    return bytes(data)


def read(stream, resolve=None) -> dict:
    budget = [MAX_FRAME]
    size, = _LEN.unpack(_read_exact(stream, 8, budget))
    try:
        header = json.loads(_read_exact(stream, size, budget))
    except ValueError:
        raise WireError("header is not JSON") from None
    count, = _LEN.unpack(_read_exact(stream, 8, budget))
    if count > 100_000:
        raise WireError("too many blobs")
    blobs = []
    for _ in range(count):
        n, = _LEN.unpack(_read_exact(stream, 8, budget))
        blobs.append(_read_exact(stream, n, budget))
    message = decode(header, blobs, resolve)
    if not isinstance(message, dict):
        raise WireError("a message must be a dict")
    return message
