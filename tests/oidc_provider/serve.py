"""Run the tests' OpenID provider: ``python -m tests.oidc_provider.serve PORT REDIRECT_URI LOGOUT_URI``.

Creates a fresh SQLite database (migrations), the people of PEOPLE, one confidential client
``gpuportal-test`` (secret ``gpuportal-test-secret``, RS256, the given redirect and post-logout
URIs, no consent page), a new RSA signing key, then serves on 127.0.0.1:PORT until killed.
Prints ``ready`` on stdout when it answers."""

import os
import sys
import tempfile
import threading
import urllib.request

CLIENT_ID, CLIENT_SECRET = "gpuportal-test", "gpuportal-test-secret"


def main() -> None:
    port, redirect_uri, logout_uri = sys.argv[1], sys.argv[2], sys.argv[3]
    from jwcrypto import jwk

    workdir = tempfile.mkdtemp(prefix="oidc-provider-")
    os.environ["OIDC_PROVIDER_DB"] = os.path.join(workdir, "provider.sqlite3")
    os.environ["OIDC_PROVIDER_KEY"] = jwk.JWK.generate(kty="RSA", size=2048).export_to_pem(private_key=True, password=None).decode()
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    from tests.oidc_provider.urls import PEOPLE

    call_command("migrate", verbosity=0, interactive=False)
    for username, (password, _) in PEOPLE.items():
        User.objects.create_user(username, password=password)
    Application.objects.create(
        name="gpuportal", client_id=CLIENT_ID, client_secret=CLIENT_SECRET, client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE, redirect_uris=redirect_uri,
        post_logout_redirect_uris=logout_uri, algorithm=Application.RS256_ALGORITHM, skip_authorization=True,
    )  # fmt: skip

    def announce() -> None:
        url = f"http://127.0.0.1:{port}/o/.well-known/openid-configuration"
        for _ in range(300):
            try:
                with urllib.request.urlopen(url, timeout=2):
                    print("ready", flush=True)
                    return
            except OSError:
                threading.Event().wait(0.1)

    threading.Thread(target=announce, daemon=True).start()
    call_command("runserver", f"127.0.0.1:{port}", use_reloader=False, skip_checks=True)


if __name__ == "__main__":
    main()
