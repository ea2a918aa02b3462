"""The bundle's program: Diffuse Studio, or with `--smoke-test OUT.png [MODEL]` the headless
check of diffuse.studio.smoke (start, load the demo model, generate, screenshot)."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["--smoke-test"]:
        from diffuse.studio.smoke import main
        sys.exit(main(sys.argv[2:]))
    from diffuse.studio.__main__ import main
    sys.exit(main())
