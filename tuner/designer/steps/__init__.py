"""The designers that execute the decision table (``strategy.next_step``): constrained BO
(``bo``: every step kind on the study's own space) and LlamaTune around it (``embedded``).
"""
