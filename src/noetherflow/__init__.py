"""noetherflow."""
