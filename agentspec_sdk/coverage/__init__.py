"""Coverage and exactness tooling: how much of real-world JSON Schema compiles, and whether each
grammar is exact (`agentspec coverage`). Above structure: it drives the compiler with the three judges
(`grammar_checks`), hypothesis-jsonschema and jsonschema (`exactness`); structure imports nothing here."""
