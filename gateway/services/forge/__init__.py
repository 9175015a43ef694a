"""GitHub as one more way in: publishing pull requests, webhook deliveries, who counts."""
