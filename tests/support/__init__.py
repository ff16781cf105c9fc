"""Test-only support: launchers, harnesses and linters the product does not ship."""
