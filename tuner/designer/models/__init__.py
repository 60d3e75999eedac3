"""The models a step learns from the study's trials: the GPs per outcome (kernels, the
likelihood's noise, the fit and its cache), the posterior ranking of measured trials, and
knob importance read from a fit. Built on ``fast`` only.
"""
