"""What the SDK and the server share, and neither owns: the tensor type and its dtypes,
validation (docs/contract.md ("Tensors")), both codecs (protobuf, with the hand-framed Execute messages, and
JSON), the shared-memory segment layout, the errors and their code tables, and the names both
wires use. It imports neither side; both import it, never each other's private modules."""

# The package's version, for both sides (the server's /v2 reads it where no distribution is
# installed); pyproject.toml's is the same, and a test holds them together.
__version__ = "0.1.0"
