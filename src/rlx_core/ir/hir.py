"""HIR ops: placeholder until filled."""
