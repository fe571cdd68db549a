"""Terminal presentation: tables, progress lines, plots."""
