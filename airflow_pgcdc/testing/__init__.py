"""Test-bed machinery that users can run too (``pgcdc sandbox``): see :mod:`.spark`."""
