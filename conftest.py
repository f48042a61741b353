"""Root conftest of the repository: shared by the project's own tests and the examples."""

pytest_plugins = ("pytester",)
