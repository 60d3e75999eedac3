"""Configurations without a model: scrambled Sobol and random points (SOBOL, RANDOM, the
FILL_IN and FALLBACK outcomes), squeezed into the experts' region (PRIOR) and onto a
candidate list. Imports ``base`` only, so every layer above can sample.
"""
