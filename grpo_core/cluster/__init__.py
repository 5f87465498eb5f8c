"""Ray placement and the engine actors: the only package that imports Ray.

Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when it is first imported: "0" makes it use 127.0.0.1 as this node's
address (the default is the machine's external address, so a local Ray's servers would listen there, and a
loopback head's address would be rewritten to the external one). Set here, before any module of this package
imports Ray; set it to 1 in the environment for a multi-node cluster.
"""
import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
