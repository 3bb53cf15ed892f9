"""Mobile wrapper source for ``deploy bundle``: Kotlin (Android) and Swift (iOS) classes that load
a bundled model and run typed inputs, generated from the package signature so that names,
dtypes, shapes and layout can never drift from the model they wrap."""
