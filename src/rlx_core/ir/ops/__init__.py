"""Core op families, one module each: every op is declared once with all its facts (schema,
inference, float64 reference, C-style expression, autodiff rules, AMP policy, fusion class,
conformance cases, accuracy). :mod:`rlx_core.ir.mir` imports them, which registers the ops."""
