"""The layouts a sparse tensor may have (docs/contract.md ("Tensors")): COO after TensorFlow, and PyTorch's
compressed ones, two of them in blocks."""

LAYOUTS = ("coo", "csr", "csc", "bsr", "bsc")
COMPRESSED_LAYOUTS = ("csr", "csc", "bsr", "bsc")
BLOCK_LAYOUTS = ("bsr", "bsc")
