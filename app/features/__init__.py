"""Feature controllers: each file owns one feature's wiring between the views, the session and the
store (projects, export, compaction, the message queue, prefill progress, documents), so
MainWindow stays a frame that builds the widgets and hands them to the controllers."""
