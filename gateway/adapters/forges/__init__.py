"""The code hosts behind the Forge port: GitHub (PyGithub) and GitLab (python-gitlab)."""
