"""Tools for working on the project itself (import graph checks); not used at run time."""
