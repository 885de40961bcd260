"""Everything that talks to one library lives in that library's folder here, and nowhere else."""
