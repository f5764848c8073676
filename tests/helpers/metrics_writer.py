"""The TFRecord payloads of a TensorBoard event file."""


def records(data: bytes) -> list[bytes]:
    """The TFRecord payloads of an event file (lengths trusted, CRCs compared elsewhere)."""
    out, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at : at + 8], "little")
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    assert at == len(data)
    return out
