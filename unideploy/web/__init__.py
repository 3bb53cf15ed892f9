"""The web target: ``deploy bundle PKG --platform web`` writes a static site that runs the package's
ONNX models in a browser with ONNX Runtime Web, and ``deploy verify SITE`` proves it in headless
Chromium against the package's reference outputs."""
