"""The rack frontier search: screen, plan, replay and report (rackserve sim frontier)."""
