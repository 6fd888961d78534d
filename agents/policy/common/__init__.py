"""Parts every stage may share: in-flight accounting, the prefix index, pickers, SLO classes."""
