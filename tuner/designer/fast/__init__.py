"""The numerical fast paths: closed-form pieces that stand in for GPyTorch objects where a
step evaluates many candidates (the prediction caches' shared rows, the RBF kernel's
moments, LogNEI's terms over candidate samples). They import nothing else of the designer.
"""
