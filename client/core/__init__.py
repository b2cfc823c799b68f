"""What the SDK and the server share, and neither owns: the tensor type and its dtypes,
validation (SPEC section 2), both codecs (protobuf, with the hand-framed Execute messages, and
JSON), the shared-memory segment layout, the errors and their code tables, and the names both
wires use. It imports neither side; both import it, never each other's private modules."""
