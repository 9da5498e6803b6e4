"""What the laws share and feed the code under test: the contracts' base, the cases they draw,
the float64 references."""
