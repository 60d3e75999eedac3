"""What a model step maximizes and how: the constrained noisy EI criteria (``criteria``) on
the unit box, and the batched local search for spaces with discrete knobs."""
