"""Group emitters: one module per group kind (conv, matmul, row-wise, pool, movement)."""
