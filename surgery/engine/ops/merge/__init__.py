"""mergekit's merge methods on the streaming engine.

A method is a plan of passes over one tensor in chunks: zero or more reductions (norms, dot
products, magnitude thresholds found by radix selection), then one elementwise map written at the
tensor's offset. `spec` holds the plain description of a merge (built from a mergekit YAML above
the engine), `planner` turns it into a `Plan`, `registry` maps method names to their kernels.
"""
