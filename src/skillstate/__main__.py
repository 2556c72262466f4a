import sys

try:
    from .cli.main import main
except KeyboardInterrupt:  # Ctrl-C before main() runs: as quiet as one inside it
    sys.exit(130)

sys.exit(main())
