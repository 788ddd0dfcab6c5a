"""What several test files share: fixtures' building blocks, reference runs and comparisons.

Test files import from here (``from helpers.stream import make_layout``), never from each other.
"""
