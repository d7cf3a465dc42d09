"""A real OpenID Connect provider for the sign-in tests: django-oauth-toolkit's, in a Django
process of its own on 127.0.0.1 (``OidcProvider`` starts it). Its users' groups are Django
groups of its own, sent in the ``groups`` claim. Two users are there to be refused: the ID token
of ``wrong-audience`` names another application, that of ``expired`` has expired (made so by
the provider's validator, as a misconfigured or replaying provider would; the site checks
what it gets)."""
