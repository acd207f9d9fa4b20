"""The wire format: MessagePack (the subset we need) in length-prefixed frames, and the limits the
host, the zygote and the child share. The host talks to the zygote over stdin/stdout with these
frames; the child talks to the zygote over its two private pipes with the same frames.
"""

import os
import struct


MAX_FRAME = 16 * 1024 * 1024
MAX_ERROR_CHARS = 2000
DEFAULT_CAP = 10000  # output cap (characters) the prepared child's shared block is sized for
HEADER = 16  # shared output block: u32 byte length, u32 truncated flag, 8 spare bytes


# ----------------------------------------------------------------------------------------------
# MessagePack (the subset we need)


def pack(obj):
    out = bytearray()
    _pack(obj, out, 0)
    return bytes(out)


def _pack(o, out, depth):
    if depth > 64:
        raise ValueError('value nested too deeply to send')
    if o is None:
        out += b'\xc0'
    elif o is True:
        out += b'\xc3'
    elif o is False:
        out += b'\xc2'
    elif isinstance(o, int):
        if 0 <= o < 0x80:
            out.append(o)
        elif -32 <= o < 0:
            out.append(o & 0xFF)
        elif 0 <= o <= 0xFF:
            out += b'\xcc' + struct.pack('>B', o)
        elif 0 <= o <= 0xFFFF:
            out += b'\xcd' + struct.pack('>H', o)
        elif 0 <= o <= 0xFFFFFFFF:
            out += b'\xce' + struct.pack('>I', o)
        elif 0 <= o <= 0xFFFFFFFFFFFFFFFF:
            out += b'\xcf' + struct.pack('>Q', o)
        elif -0x80 <= o < 0:
            out += b'\xd0' + struct.pack('>b', o)
        elif -0x8000 <= o < 0:
            out += b'\xd1' + struct.pack('>h', o)
        elif -0x80000000 <= o < 0:
            out += b'\xd2' + struct.pack('>i', o)
        elif -0x8000000000000000 <= o < 0:
            out += b'\xd3' + struct.pack('>q', o)
        else:
            out += b'\xcb' + struct.pack('>d', float(o))
    elif isinstance(o, float):
        out += b'\xcb' + struct.pack('>d', o)
    elif isinstance(o, str):
        b = o.encode('utf-8', 'replace')
        n = len(b)
        if n < 32:
            out.append(0xA0 | n)
        elif n <= 0xFF:
            out += b'\xd9' + struct.pack('>B', n)
        elif n <= 0xFFFF:
            out += b'\xda' + struct.pack('>H', n)
        else:
            out += b'\xdb' + struct.pack('>I', n)
        out += b
    elif isinstance(o, (bytes, bytearray, memoryview)):
        b = bytes(o)
        n = len(b)
        if n <= 0xFF:
            out += b'\xc4' + struct.pack('>B', n)
        elif n <= 0xFFFF:
            out += b'\xc5' + struct.pack('>H', n)
        else:
            out += b'\xc6' + struct.pack('>I', n)
        out += b
    elif isinstance(o, (list, tuple)):
        n = len(o)
        if n < 16:
            out.append(0x90 | n)
        elif n <= 0xFFFF:
            out += b'\xdc' + struct.pack('>H', n)
        else:
            out += b'\xdd' + struct.pack('>I', n)
        for v in o:
            _pack(v, out, depth + 1)
    elif isinstance(o, dict):
        n = len(o)
        if n < 16:
            out.append(0x80 | n)
        elif n <= 0xFFFF:
            out += b'\xde' + struct.pack('>H', n)
        else:
            out += b'\xdf' + struct.pack('>I', n)
        for k, v in o.items():
            _pack(k, out, depth + 1)
            _pack(v, out, depth + 1)
    else:
        raise TypeError('cannot send a value of type %s to the host' % type(o).__name__)


def unpack(data):
    value, pos = _unpack(memoryview(data), 0, 0)
    if pos != len(data):
        raise ValueError('trailing bytes after MessagePack value')
    return value


_FIXED = {
    0xCC: ('>B', 1),
    0xCD: ('>H', 2),
    0xCE: ('>I', 4),
    0xCF: ('>Q', 8),
    0xD0: ('>b', 1),
    0xD1: ('>h', 2),
    0xD2: ('>i', 4),
    0xD3: ('>q', 8),
    0xCA: ('>f', 4),
    0xCB: ('>d', 8),
}


def _unpack(b, i, depth):
    if depth > 64:
        raise ValueError('MessagePack value nested too deeply')
    c = b[i]
    i += 1
    if c < 0x80:
        return c, i
    if c >= 0xE0:
        return c - 0x100, i
    if 0xA0 <= c <= 0xBF:
        n = c & 0x1F
        return _str(b, i, n), i + n
    if 0x90 <= c <= 0x9F:
        return _array(b, i, c & 0x0F, depth)
    if 0x80 <= c <= 0x8F:
        return _map(b, i, c & 0x0F, depth)
    if c == 0xC0:
        return None, i
    if c == 0xC2:
        return False, i
    if c == 0xC3:
        return True, i
    if c in _FIXED:
        fmt, n = _FIXED[c]
        return struct.unpack_from(fmt, b, i)[0], i + n
    if c in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        w = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}[c]
        n = int.from_bytes(b[i : i + w], 'big')
        i += w
        if i + n > len(b):
            raise ValueError('truncated MessagePack string')
        if c >= 0xD9:
            return _str(b, i, n), i + n
        return bytes(b[i : i + n]), i + n
    if c in (0xDC, 0xDD):
        w = 2 if c == 0xDC else 4
        return _array(b, i + w, int.from_bytes(b[i : i + w], 'big'), depth)
    if c in (0xDE, 0xDF):
        w = 2 if c == 0xDE else 4
        return _map(b, i + w, int.from_bytes(b[i : i + w], 'big'), depth)
    if c in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9):
        if c >= 0xD4:
            n = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}[c]
        else:
            w = {0xC7: 1, 0xC8: 2, 0xC9: 4}[c]
            n = int.from_bytes(b[i : i + w], 'big')
            i += w
        ext_type = struct.unpack_from('>b', b, i)[0]
        if c == 0xD4 and ext_type == 0:  # msgpackr's `undefined`
            return None, i + 1 + n
        raise ValueError('unsupported MessagePack extension type %d' % ext_type)
    raise ValueError('invalid MessagePack byte 0x%02x' % c)


def _str(b, i, n):
    if i + n > len(b):
        raise ValueError('truncated MessagePack string')
    return bytes(b[i : i + n]).decode('utf-8', 'surrogatepass')


def _array(b, i, n, depth):
    out = []
    for _ in range(n):
        v, i = _unpack(b, i, depth + 1)
        out.append(v)
    return out, i


def _map(b, i, n, depth):
    out = {}
    for _ in range(n):
        k, i = _unpack(b, i, depth + 1)
        v, i = _unpack(b, i, depth + 1)
        if isinstance(k, list):
            k = tuple(k)
        out[k] = v
    return out, i


# ----------------------------------------------------------------------------------------------
# Frames


def frame(payload):
    return struct.pack('>I', len(payload)) + payload


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class FrameReader:
    """Buffers bytes from a descriptor and splits them into length-prefixed frames."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = bytearray()
        self.eof = False

    def fill(self):
        """One read (call when select says readable, or to block for more). False at end of file."""
        try:
            data = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return True
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def next(self):
        """The next complete frame's payload, or None. Raises ValueError on an oversized frame."""
        if len(self.buf) < 4:
            return None
        n = struct.unpack_from('>I', self.buf, 0)[0]
        if n > MAX_FRAME:
            raise ValueError('frame of %d bytes exceeds the %d-byte limit' % (n, MAX_FRAME))
        if len(self.buf) < 4 + n:
            return None
        payload = bytes(self.buf[4 : 4 + n])
        del self.buf[: 4 + n]
        return payload

    def read_blocking(self):
        while True:
            p = self.next()
            if p is not None:
                return p
            if not self.fill():
                return None
