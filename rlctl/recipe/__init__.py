"""The recipe: schema, loading (extends, --set), what it references (data, models), and its plan."""
