"""`traceless report` (html.py: every benchmark, attack and audit into one page) and the output tail
they all share (output.py). Imports audit and bench; neither imports the other."""
