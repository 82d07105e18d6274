"""The SQL front end: grammar, parser, formatter, expressions and execution."""
