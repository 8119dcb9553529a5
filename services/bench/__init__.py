"""`rackserve bench`: an HTTP benchmark client for a running cluster (see __main__)."""
