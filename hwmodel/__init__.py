"""The chip: functional execution (numbers) and timing simulation (cycles); built-in chip files."""
