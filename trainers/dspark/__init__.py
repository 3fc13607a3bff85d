"""DSpark: DFlash's block draft with next-token queries, a Markov head and a confidence head."""
