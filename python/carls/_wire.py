"""The one message this package packs itself: carls.proto's FeaturePut (keys and feature records), for
put_features. Field numbers as in proto/carls.proto; tests/python checks the server reads them back."""
import struct


def _varint(v):
    v &= (1 << 64) - 1  # int64 negatives as their two's complement, as protobuf does
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(field, payload):
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def feature_record(neighbors=(), weights=None, label=None, confidence=0.0, data=b"", version=0, encode=None):
    """A packed carls.FeatureRecord. neighbors: keys (already bytes, via encode); weights: one float per
    neighbour or None; label: an int (int_label), a float (float_label) or None."""
    out = bytearray()
    for k in neighbors:
        out += _len_field(1, encode(k))
    if weights is not None:
        weights = [float(w) for w in weights]
        if len(weights) != len(neighbors):
            raise ValueError("feature record: %d weights for %d neighbours" % (len(weights), len(neighbors)))
        out += _len_field(2, struct.pack("<%df" % len(weights), *weights))
    if label is not None:
        if isinstance(label, bool) or not isinstance(label, (int, float)):
            raise TypeError("feature record: label must be an int or a float, not %s" % type(label).__name__)
        if isinstance(label, int):
            if not -(1 << 63) <= label < (1 << 63):
                raise ValueError("feature record: label %d is outside int64" % label)
            out += _varint(3 << 3 | 0) + _varint(label)
        else:
            out += _varint(4 << 3 | 5) + struct.pack("<f", label)
    if confidence:
        out += _varint(5 << 3 | 5) + struct.pack("<f", float(confidence))
    if data:
        out += _len_field(6, bytes(data))
    if version:
        if not 0 <= version < (1 << 64):
            raise ValueError("feature record: version %d is outside uint64" % version)
        out += _varint(7 << 3 | 0) + _varint(version)
    return bytes(out)


def feature_put(keys, records):
    """A packed carls.FeaturePut of keys (bytes) and records (packed FeatureRecords), one per key."""
    out = bytearray()
    for k in keys:
        out += _len_field(1, k)
    for r in records:
        out += _len_field(2, r)
    return bytes(out)
