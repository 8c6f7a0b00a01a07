"""Optional integrations with other frameworks; each module imports its framework lazily."""
