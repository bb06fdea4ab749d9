"""One module per output format: ``parse_xxx(path_or_text) -> Parsed[rows]``, pure and tolerant."""
