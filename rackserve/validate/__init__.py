"""`rackserve validate`: the twin against public measured serving points (data/public-points)."""
