"""longeval: how well do language models use long contexts?"""

__version__ = "0.1.0"
