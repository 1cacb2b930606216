"""kiln.sym: the ops a hybridized block sees while it is traced (F in hybrid_forward).

Inside a trace the same functions as kiln.nd apply to symbolic arrays and are recorded into the
graph instead of run; this module exists so that code written for Gluon's F.* reads the same.
"""
from .nd import *  # noqa: F401,F403
from .nd import random  # noqa: F401
