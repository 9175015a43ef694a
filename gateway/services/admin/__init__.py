"""Administration: principals and their credentials, the audit trail, bootstrapping a workspace."""
