"""Text layer: tokenizer, prompt rendering, haystack corpora, and contexts built in token space."""
