"""One contract module per op family: descriptors, Args, saved-tensor layouts and the ops
(``OPS``) that every backend implementing the family imports. Nothing here imports a backend."""
