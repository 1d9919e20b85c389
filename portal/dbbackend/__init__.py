"""The portal's database backend: Django's PostgreSQL backend with a health check that costs no
round trip (base.py). DATABASE_URL selects it (portal.env.Env.database)."""
