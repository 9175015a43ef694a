"""The declaration repository in git: reads in-process (pygit2), writes with GitPython, agents' clones, and git's smart HTTP."""
