"""`freshkey demo`: the whole flow on private services, with a driver, readers and a verdict."""
